"""The networks and what judges play: the policy network, the reward models, the synthetic
teachers, and the reward path (how a prediction becomes what the learner is paid). Above ``store``,
``atari`` and ``core``."""
