"""An example workload: points on noisy concentric rings, classified by which ring they lie on.

``my_workload.data:rings`` returns ``(train, val)`` map-style datasets; ``my_workload.model:ring_net``
returns a ``torch.nn.Module``.  Neither imports anything from elastic-large-batch.
"""
