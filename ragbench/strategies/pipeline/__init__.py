"""Your own system under test as a strategy: the strategy, its parameters, its answer contract, its import target and its HTTP transport."""
