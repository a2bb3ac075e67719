"""Optimizers as ops: SGD, Momentum (optionally Nesterov) and Adam, with `.minimize(loss)`."""

from nestflow.optimizer.optimizer import SGD, Adam, Momentum, Optimizer

__all__ = ["SGD", "Adam", "Momentum", "Optimizer"]
