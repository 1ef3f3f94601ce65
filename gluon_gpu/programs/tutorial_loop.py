"""The baseline: the training loop of MXNet's "Use GPUs" tutorial, kept as the tutorial
writes it (non-hybridized ``nn.Sequential`` LeNet, ``DataLoader`` with
``transform_first(ToTensor, Normalize)`` and 4 workers, ``split_and_load`` per batch,
``l.sum().asscalar()`` per batch), so the benchmark can time it beside ours. For any
other model the same loop trains gluoncv's zoo network as GluonCV's CIFAR script does:
built by ``model_zoo.get_model(name, classes=...)`` and hybridized.

The only change: the tutorial's ``datasets.FashionMNIST`` downloads, so the arrays
(``(N, 1, 28, 28)`` uint8, as gluon_gpu's data layer stores them) come from our IDX
reader through an ``ArrayDataset``, laid out ``(N, 28, 28, 1)`` as the tutorial's are.
"""
from time import time

from mxnet import autograd, gluon, init, nd
from mxnet.gluon import nn
from mxnet.gluon.data.vision import transforms

from ..models.zoo import ALIASES


def tutorial_lenet():
    net = nn.Sequential()
    net.add(nn.Conv2D(channels=6, kernel_size=5, activation='relu'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(channels=16, kernel_size=3, activation='relu'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Flatten(),
            nn.Dense(120, activation="relu"),
            nn.Dense(84, activation="relu"),
            nn.Dense(10))
    return net


def run(train_images, train_labels, test_images, test_labels, devices, epochs,
        batch_size=256, num_workers=4, on_epoch=None, model="lenet", classes=10):
    """Train as the tutorial does; returns per-epoch seconds and the final validation accuracy."""
    if model == "lenet":
        net = tutorial_lenet()
    else:
        from gluoncv import model_zoo
        net = model_zoo.get_model(ALIASES.get(model, model), classes=classes)
        net.hybridize()

    transformer = transforms.Compose([transforms.ToTensor(), transforms.Normalize(0.13, 0.31)])
    mnist_train = gluon.data.ArrayDataset(nd.array(train_images.transpose(0, 2, 3, 1), dtype='uint8'),
                                          train_labels.astype('float32'))
    mnist_valid = gluon.data.ArrayDataset(nd.array(test_images.transpose(0, 2, 3, 1), dtype='uint8'),
                                          test_labels.astype('float32'))
    train_data = gluon.data.DataLoader(mnist_train.transform_first(transformer),
                                       batch_size=batch_size, shuffle=True, num_workers=num_workers)
    valid_data = gluon.data.DataLoader(mnist_valid.transform_first(transformer),
                                       batch_size=batch_size, num_workers=num_workers)

    net.initialize(force_reinit=True, ctx=devices, init=init.Xavier())
    softmax_cross_entropy = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})

    seconds = []
    for epoch in range(epochs):
        train_loss = 0.
        tic = time()
        for data, label in train_data:
            data_list = gluon.utils.split_and_load(data, devices)
            label_list = gluon.utils.split_and_load(label, devices)
            with autograd.record():
                losses = [softmax_cross_entropy(net(X), y)
                          for X, y in zip(data_list, label_list)]
            for l in losses:
                l.backward()
            trainer.step(batch_size)
            train_loss += sum([l.sum().asscalar() for l in losses])
        seconds.append(time() - tic)
        if on_epoch:
            on_epoch(epoch, train_loss / len(train_data) / batch_size, seconds[-1])

    valid_acc = 0.
    for data, label in valid_data:
        data_list = gluon.utils.split_and_load(data, devices)
        label_list = gluon.utils.split_and_load(label, devices)
        valid_acc += sum([(net(X).argmax(axis=1) == y.astype('float32')).sum().asscalar()
                          for X, y in zip(data_list, label_list)])
    return seconds, valid_acc / len(test_labels)
