"""Cost and plan: the time model, `fab plan`'s table, spend so far, `fab bench`'s calibration, FLOPs and MFU."""
