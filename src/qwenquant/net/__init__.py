"""Small local-network helpers: free ports and who listens on one."""
