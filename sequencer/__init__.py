"""The sequencer: stamps globally ordered IDs for strict-order topics.

Not built yet (its issue comes after replication). The batch format already carries
``global_id_base`` so strict-order topics need no format change.
"""
