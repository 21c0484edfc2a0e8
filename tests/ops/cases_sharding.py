from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

# Outside a mesh (as the sweep runs them) the constraint is the identity, forward and back.
CASES = [
    Case(ops.sharding_constraint(spec=("data", "model")), (rand([4, 6]),), "sharding_constraint"),
    Case(
        ops.sharding_constraint(spec=(("data", "model"),)), (rand([4]),), "sharding_constraint-1d"
    ),
]
