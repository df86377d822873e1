"""The warm path: ``rdma-agent`` keeps the plugin stack imported and runs CNI calls for thin clients.

``client`` (stdlib only) is what a CNI executable runs first; ``wire`` is the frame format both sides
share; ``server`` accepts connections and forks one ``worker`` per call; ``plugins`` finds a plugin's
spec by its name; ``reconcile`` restores the host for attachments whose netns is gone.
"""
