"""Fabric tasks and the boto3/SSH code behind them: discovery, setup, distribution, launch."""
