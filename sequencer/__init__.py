"""The sequencer: grants globally ordered 64-bit IDs for strict-order topics.

``python -m sequencer --zk HOST:PORT --id N`` runs one instance; run two or more and one
is active (``sequencer/service.py``). The ID and lease rules are pure and unit tested
(``sequencer/allocator.py``); clients find the active instance through ZooKeeper
(``fabric/sequencer_client.py``).
"""
