"""What a worker process runs outside workflow code: the worker itself, the activities, the agent it serves.

Activities may do I/O and read the clock; what they return is recorded in the history, so replays never run them.
"""
