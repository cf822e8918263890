"""A node's software and files: the profiles, the setup script, idle auto-stop, the files on the master,
host keys from a console, a worker's first boot."""
