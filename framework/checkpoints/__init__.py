"""Checkpoints: a run's state at an epoch end (`state`), its tensors in one safetensors file
(`tensor_file`), written by a thread while the run goes on (`writer`)."""
