"""Placeholder until this module's tasks land."""

TASKS: list = []
