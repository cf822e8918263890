"""A training job, decided before anything is touched: the run request, its plan (nodes, layout, launch),
its files and commands on the master, its log, report and summary, your own program's plans, the
PyTorchJob."""
