"""The OpenAI-compatible gateway a black-box agent plays its episodes through (``env: {name: agent}``).

``request`` checks a Chat Completions request, ``render`` turns its messages into the text the model continues and
a sampled turn into OpenAI's reply (tool calls in the model's own format), ``session`` assembles an episode's calls
into training sequences token for token, and ``server`` is the HTTP side and the batched answering. The rollout
that drives it is ``rlft.rollout.agent``; ``rlft serve`` reads and writes through ``request`` and ``render`` too.
"""
