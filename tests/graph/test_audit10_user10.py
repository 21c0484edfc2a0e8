"""Audit 10 (user10): a researcher's custom pass, as the graphs guide describes it."""

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import GraphBuilder, Pat, Rule, check_pass, graph_rewrite, interpret, rewrite_pass

LEAKY = Rule(Pat.op("relu", Pat.var("x")), lambda m: m.exec(ops.leaky_relu(), m["x"]))


def relu_graph():
    b = GraphBuilder()
    x = b.input((3,), name="x")
    return b.build([b.exec(ops.relu(), x, name="act")])


@pytest.mark.parametrize("make", [lambda: rewrite_pass(LEAKY), lambda: rewrite_pass([LEAKY])])
def test_rewrite_pass_takes_rules_as_arguments_or_as_one_list(make):
    # graph_rewrite takes a list of rules; rewrite_pass([rule]) used to die with a raw
    # AttributeError ('list' object has no attribute 'label') once run
    g = make()(relu_graph())
    x = np.float32([-2.0, 0.0, 3.0])
    np.testing.assert_allclose(interpret(g, x), np.where(x > 0, x, 0.01 * x), rtol=1e-6)
    assert check_pass(rewrite_pass([LEAKY]), relu_graph(), atol=1e-1, grads=False).max_error > 0


def test_graph_rewrite_takes_one_rule_and_names_what_is_not_a_rule():
    assert [n.cmd.name for n in graph_rewrite(relu_graph(), LEAKY).nodes] == ["leaky_relu"]
    with pytest.raises(GraphError, match=r"rules\[1\] is str 'oops', not a Rule"):
        graph_rewrite(relu_graph(), [LEAKY, "oops"])
    with pytest.raises(
        GraphError, match=r"rewrite_pass\('p'\): rules are a list of Rule, got function"
    ):
        rewrite_pass(lambda m: None, name="p")


def test_a_misspelt_command_in_a_pattern_is_an_error_not_a_pass_that_does_nothing():
    # Pat.op("rleu", ...) used to match nothing: the pass silently left the graph as it was
    with pytest.raises(GraphError, match=r"unknown command 'rleu'. Did you mean relu\?"):
        Pat.op("rleu", Pat.var("x"))
    with pytest.raises(GraphError, match=r"unknown command 'tnah'"):
        Pat.op(("relu", "tnah"), Pat.var("x"))
    with pytest.raises(GraphError, match=r"cmd is a command name.*got Command"):
        Pat.op(ops.relu(), Pat.var("x"))
    assert Pat.op(("relu", "tanh")).cmds == {"relu", "tanh"}
    assert Pat.op(None, attrs=("pure",)).cmds is None


def test_a_rule_given_as_a_pass_says_to_wrap_it_with_rewrite_pass():
    from fnnc.graph import compile

    with pytest.raises(
        GraphError, match=r"got the rule '<lambda>': make it a pass with .*rewrite_pass"
    ):
        compile(relu_graph(), passes=[LEAKY])
