"""Local stacks of KnitTrans processes: the demo's and ``knittrans up``'s (one supervised process group)."""
