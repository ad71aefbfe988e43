"""Ablations that train a variant with one RunConfig field at other values than the profile's.

The learning-rate and stabiliser ablations ask the same thing of one setting:
does the variant's gap to softmax belong to it? Each is described here once;
the benchmark plans its runs under ablations/<field>/<dataset>/<label>/,
`aggregate.add_comparisons` reads each against the variant row and against
softmax at the same value, and the report renders one section per ablation,
all from this table.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class SettingAblation:
    """One ablation of a setting.

    Attributes:
        field: the RunConfig field it sets; also the experiment's name, the
            profile's attribute ({"variants", "values", "datasets"}) and the
            results folder ablations/<field>/.
        tag: what a run's label adds to the variant's name before the value
            ("favor-absolute-lr0.0005").
        value_format: how a value is written in labels and the report.
        name: the setting in prose.
        noun: the setting in a table's words ("at this rate").
        preposition: "at" a rate, "with" a stabiliser.
        suffix: how the comparisons' keys end (`key`: "gap_closed_by_rate").
        heading: the report section's, after "Ablation: ".
        about: the report section's opening sentence, `{own}` the profile's
            value(s).
    """

    field: str
    tag: str
    value_format: str
    name: str
    noun: str
    preposition: str
    suffix: str
    heading: str
    about: str

    def text(self, value):
        return self.value_format.format(value)

    def label(self, variant, value):
        return f"{variant}-{self.tag}{self.text(value)}"

    def key(self, comparison):
        """A comparison ("change_from_profile", "gap_to_softmax_same", "gap_closed_by", "interaction_same") as the
        key of this ablation's cells (`aggregate.setting_comparisons`)."""
        return f"{comparison}_{self.suffix}"

    def profile_words(self):
        return f"{self.preposition} the profile's {self.noun}"

    def value_words(self, value):
        return f"{self.preposition} {self.text(value)}"


SETTING_ABLATIONS = {ablation.field: ablation for ablation in (
    SettingAblation(
        field="learning_rate", tag="lr", value_format="{:g}", name="learning rate", noun="rate", preposition="at",
        suffix="rate", heading="the peak learning rate",
        about="The profile's schedule (warm-up, then cosine decay) with another peak learning rate than its own ({own})"),
    SettingAblation(
        field="stabilizer", tag="stabilizer-", value_format="{}", name="stabiliser", noun="stabiliser",
        preposition="with", suffix="stabilizer", heading="FAVOR+'s stabiliser",
        about="FAVOR+'s features with another stabiliser than the profile's ({own}), the maximum M subtracted inside "
              "the exponential (`favor_features.positive_exp`): `exponent` takes the maximum of the whole exponent "
              "w^T x' - |x'|^2/2 instead of the logits w^T x', so that one long key no longer pushes the other keys' "
              "features under the epsilon floor (`experiments.favor_floor`)"),
)}
