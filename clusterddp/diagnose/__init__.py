"""Where is each rank? Stack dumps on demand, hang detection, and the cluster doctor."""
