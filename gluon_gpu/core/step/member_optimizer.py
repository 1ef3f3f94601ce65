"""One optimizer per member under the one Updater a gluon.Trainer holds: a sweep's
members differ in their learning rate, schedule, weight decay and momentum, and each
must compute exactly what its configuration computes alone."""
import mxnet as mx


class MemberOptimizer(mx.optimizer.Optimizer):
    """Member k's parameters updated by ``optimizers[k]``, under the one Updater a Trainer
    holds: its states, update counts (by parameter index) and checkpoints are the usual
    ones, and each optimizer computes exactly what it computes alone (its learning rate,
    schedule, weight decay, momentum). ``owners``: parameter index -> member."""

    # Parameters per aggregated update handed to the members' optimizers: each member's
    # run of a device's parameters becomes one multi-tensor operator (MXNet's limit is 60;
    # 61 crashes it). Fewer operator calls per step: the Python thread that issues them
    # shares the cores with the engine's workers.
    AGGREGATE = 45

    def __init__(self, optimizers):
        super().__init__(learning_rate=optimizers[0].lr)
        self.optimizers, self.owners = list(optimizers), {}
        aggregate = min(o.aggregate_num for o in self.optimizers)
        self.aggregate_num = max(aggregate, self.AGGREGATE) if aggregate > 0 else 0  # 0: not by this optimizer

    def create_state_multi_precision(self, index, weight):
        return self.optimizers[self.owners[index]].create_state_multi_precision(index, weight)

    def update_multi_precision(self, index, weight, grad, state):
        """Each member's run of ``index`` by its own optimizer, counting from this
        optimizer's ``num_update`` as MemberTrainer.update_members set it."""
        many = isinstance(index, (list, tuple))
        items = list(zip(index, weight, grad, state)) if many else [(index, weight, grad, state)]
        start = self.num_update
        runs = []  # [(member, [items])], consecutive parameters of one member together
        for item in items:
            member = self.owners[item[0]]
            if runs and runs[-1][0] == member:
                runs[-1][1].append(item)
            else:
                runs.append((member, [item]))
        for member, run in runs:
            optimizer = self.optimizers[member]
            optimizer.param_dict, optimizer.rescale_grad = self.param_dict, self.rescale_grad  # lr_mult, wd_mult
            optimizer._index_update_count = self._index_update_count  # pylint: disable=protected-access
            optimizer.num_update = start
            columns = [list(c) for c in zip(*run)]
            optimizer.update_multi_precision(*(columns if many else [c[0] for c in columns]))
            self.num_update = max(self.num_update, optimizer.num_update)

    def update(self, index, weight, grad, state):
        self.update_multi_precision(index, weight, grad, state)

    def _set_current_context(self, device_id):
        """One update count per parameter, whichever device it lives on: a member
        resumed on another device (or worker) goes on counting its own."""
        self._index_update_count = self._all_index_update_counts.setdefault(0, {})

    @property
    def learning_rate(self):
        """The first member's (a sweep's members each have their own)."""
        first = self.optimizers[0]
        return first.lr_scheduler(self.num_update) if first.lr_scheduler is not None else first.lr
