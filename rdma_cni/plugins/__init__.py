"""Policy: what each plugin does for each CNI verb, one folder per plugin (``macvlan``, ``ipvlan``,
``multus``), each over the mechanisms (``net``, ``rdma``, ``state``, ``delegate_config``)."""
