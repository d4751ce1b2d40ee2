"""Ways to run the one app: N worker processes on one machine, and Ray Serve."""
