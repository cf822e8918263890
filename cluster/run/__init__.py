"""A supervised run (`fab train --managed`): the supervisor's decisions, recovery, the run's spec and log,
a lost master's replacement."""
