"""What runs on each worker: the data order, the workload, the large-batch policies, gradient
combination and the DDP loop, and the driver <-> worker link.  Never imports the driver."""
