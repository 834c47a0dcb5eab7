"""ronde: Horovod-style data-parallel training. The PyTorch front end is
``ronde.torch`` (``import ronde.torch as rt``)."""
