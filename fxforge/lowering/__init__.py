"""Graph-to-graph lowerings that run before grouping: decompositions, hygiene, out-variants."""
