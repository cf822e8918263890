"""The stack's settings and what they make: the settings table and ClusterSpec, the instance catalog,
images, tags, the subnet rule, which changes replace nodes, the worker group, the lifecycle, leftovers."""
