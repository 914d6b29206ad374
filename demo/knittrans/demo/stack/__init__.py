"""Starting, watching and stopping the demo's local stack of processes."""
