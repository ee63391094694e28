"""Sample checkpoints, photographs and scenes, ``probe demo`` and ``probe doctor``: the way in
for a new user, built on the stages and imported by none of them."""
