"""`forge deploy`: the smoke stack of a profile as Kubernetes objects."""
