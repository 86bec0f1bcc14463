"""Starting and supervising workers: on this node (supervisor) and on remote hosts (ssh)."""
