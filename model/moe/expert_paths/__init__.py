"""Expert paths beyond the reference and the pure-PyTorch rewrites of model.moe.experts, one module each.

Every module in this folder is imported with model.moe, and registers its paths into EXPERT_PATHS when
imported: adding a path is adding its module here (and its tolerance in model/tolerances.py).
"""
from ...dispatch.paths import import_submodules

import_submodules(__name__, __path__)
