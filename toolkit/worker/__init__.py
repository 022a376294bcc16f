"""The worker side of a step: the model's forward on one rank (ModelRunner, the same object at
TP=1 and on every tensor-parallel rank) and the Executor that runs it (LocalExecutor here, or
toolkit.parallel's TPExecutor over N processes)."""
