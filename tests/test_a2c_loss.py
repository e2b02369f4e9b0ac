"""The A2C loss moves the policy and the critic the right way."""

import numpy as np
import torch

from lib.a2c.experience import BOOT_NEXT, BOOT_NONE, Transitions
from lib.a2c.train import a2c_loss
from lib.models.policy import AtariA2C


def batch(actions, returns, mode=BOOT_NONE, seed=0):
    rng = np.random.default_rng(seed)
    b = len(actions)
    obs = rng.integers(0, 255, (b, 4, 84, 84), dtype=np.uint8)
    return Transitions(
        obs=obs,
        actions=np.asarray(actions, np.int64),
        returns=np.asarray(returns, np.float32),
        discount=np.full(b, 0.99**5, np.float32),
        steps=np.full(b, 5),
        boot_mode=np.full(b, mode, np.int8),
        boot_obs=obs.copy(),
        env=np.arange(b),
    )


def step(net, b, boot, lr=1e-3):
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    loss, m = a2c_loss(net, b, boot, torch.device("cpu"), 0.0)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return m


def test_positive_advantage_raises_the_action_probability():
    torch.manual_seed(0)
    net = AtariA2C((4, 84, 84), 6)
    b = batch([2] * 8, [10.0] * 8)
    x = torch.from_numpy(b.obs)
    before = torch.softmax(net(x)[0], 1)[:, 2].mean().item()
    v_before = net(x)[1].mean().item()
    for _ in range(5):
        step(net, b, np.zeros(8, np.float32))
    after = torch.softmax(net(x)[0], 1)[:, 2].mean().item()
    assert after > before
    assert net(x)[1].mean().item() > v_before  # critic moves towards the return 10


def test_negative_advantage_lowers_it():
    torch.manual_seed(0)
    net = AtariA2C((4, 84, 84), 6)
    b = batch([4] * 8, [-10.0] * 8)
    x = torch.from_numpy(b.obs)
    before = torch.softmax(net(x)[0], 1)[:, 4].mean().item()
    for _ in range(5):
        step(net, b, np.zeros(8, np.float32))
    assert torch.softmax(net(x)[0], 1)[:, 4].mean().item() < before


def test_bootstrap_value_enters_the_target():
    torch.manual_seed(0)
    net = AtariA2C((4, 84, 84), 6)
    b = batch([0] * 4, [0.0] * 4, mode=BOOT_NEXT)
    _, m0 = a2c_loss(net, b, np.zeros(4, np.float32), torch.device("cpu"), 0.01)
    _, m1 = a2c_loss(net, b, np.full(4, 100.0, np.float32), torch.device("cpu"), 0.01)
    # target = returns + gamma^5 * V(boot): a large bootstrap value gives a large value loss
    assert m1["losses/value"] > m0["losses/value"] + 1000
    assert np.isfinite(list(m1.values())).all()
