"""What-if `before_s34` for `../ws4_async_gap/whatif_variants.py`: the model before the thirty-fourth
session, where the calibration timed PipeDream's stash after its cycle's forward and backward
through the modules. On profiles that kept that figure (`weight_passes.stash.after_plain_medians_s`,
since the session) the stash's per-set medians are replaced by it and its fit is scaled by the
ratio of their sums; older profiles are played as they are (they timed the stash that way)."""

import copy

import simulator.profile as simulator_profile


def _stash_after_plain(document):
    stash = (document.get("weight_passes") or {}).get("stash")
    if not isinstance(stash, dict) or "after_plain_medians_s" not in stash:
        return document
    document = copy.deepcopy(document)
    stash = document["weight_passes"]["stash"]
    after_plain = stash.pop("after_plain_medians_s")
    scale = sum(after_plain) / sum(stash["medians_s"]) if sum(stash["medians_s"]) > 0 else 1.0
    stash["medians_s"] = after_plain
    stash["intercept_s"] *= scale
    stash["per_param_s"] *= scale
    return document


def patch_stash_order() -> None:
    original_from_dict = simulator_profile.profile_from_dict
    simulator_profile.profile_from_dict = lambda document, *args, **kwargs: original_from_dict(
        _stash_after_plain(document), *args, **kwargs)
