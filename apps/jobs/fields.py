"""Strict DRF fields: JSON types are checked, not coerced ("2" is not an integer, 1 is not a
string), because a client sending the wrong type has a bug it should hear about."""

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError("must be a string")
        if any(ord(ch) < 32 for ch in data):
            raise serializers.ValidationError("must not contain control characters")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            raise serializers.ValidationError("must be an integer")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            raise serializers.ValidationError("must be true or false")
        return data


class ArgvField(serializers.ListField):
    """A command as an argv list. A string is refused: it would need a shell to split it."""

    def __init__(self, **kwargs):
        kwargs.setdefault(
            "child", StrictCharField(max_length=4096, allow_blank=False, trim_whitespace=False)
        )
        kwargs.setdefault("min_length", 1)
        kwargs.setdefault("max_length", 256)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, str):
            raise serializers.ValidationError(
                'must be an argv list such as ["python", "train.py"], not a shell string'
            )
        if not isinstance(data, list):
            raise serializers.ValidationError("must be a list of strings")
        return super().to_internal_value(data)


class LabelMapField(serializers.DictField):
    """A small {key: value} map of label strings (node selectors, node labels)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("child", StrictCharField(max_length=63, allow_blank=True))
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object of label strings")
        if len(data) > 32:
            raise serializers.ValidationError("at most 32 labels")
        for key in data:
            if not key or len(key) > 63:
                raise serializers.ValidationError(
                    f"label key {key[:70]!r} must be 1..63 characters"
                )
        return super().to_internal_value(data)
