"""The device mesh and the sharding rules (sharding: encoder data parallel, W's
rows split over 'model'), the multi-node device grid (mesh_topology), and the check of the
devices jax sees against the launcher's plan (device_check), and the embedding of whole
splits over every device of every process (mesh_embedding).

Layer 4 of 13: may import runtime, data, model.
"""
