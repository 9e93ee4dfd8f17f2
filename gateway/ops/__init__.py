"""What operators see and rely on: metrics, structured logs, and bounded stops.
"""
