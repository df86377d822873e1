"""rdma-cni: CNI plugins that give Kubernetes pods an RDMA (RoCE) network plane.

Layers, from the bottom: ``cni`` (the protocol), ``net``/``rdma``/``state`` (mechanisms),
``plugins`` (what each verb does), ``cli`` (entry points). Lower layers never import higher ones.
"""

__version__ = "0.1.0"
