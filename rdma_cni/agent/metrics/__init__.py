"""rdma-agent's Prometheus metrics: where they are served (``address``), what the agent's processes
report (``events``), what is read from the node at each scrape (``node``), and the process that
serves them (``server``)."""
