"""Walking a Gluon network's block tree: the one place that reads Gluon's private
``_children`` (a block's registered children, attributes and Sequential entries alike)."""


def named_blocks(net, path=""):
    """``(path, block)`` for ``net`` and every block inside it, parents first; ``path`` is
    the dotted child names, as in parameter-file keys (``0.body.1``)."""
    yield path, net
    for name, child in net._children.items():  # pylint: disable=protected-access
        yield from named_blocks(child, f"{path}.{name}" if path else name)


def descendants(net):
    """``net`` and every block inside it, parents first."""
    return [block for _, block in named_blocks(net)]


def leaves(net):
    """The blocks of ``net`` that hold no other block (its layers)."""
    return [block for block in descendants(net) if not block._children]  # pylint: disable=protected-access
