"""Whether a JSON schema's references can end: a reference loop with no way out has no value at all.

llguidance refuses a schema whose constraints contradict each other (``minLength`` above ``maxLength``, an empty
``enum``) when it compiles it, but not one whose references lead only back to themselves: ``{"$ref": "#/$defs/x",
"$defs": {"x": {"$ref": "#/$defs/x"}}}``, or an object whose required property is the object again. That grammar
compiles, and generation then dead-ends inside the loop (no token extends the text) or runs into llguidance's
item limit. This module finds such loops before any generation, as a grammar's productive symbols are found: a
fixpoint over the schema's references, a reference marked as having a value once its schema has one given the
references marked so far.

A schema has a value here (where unsure: yes, so that no sound schema is refused) when
- it is ``true``, or none of the keys below constrains it;
- its ``$ref`` has one (and so does the rest of it);
- ``anyOf`` / ``oneOf``: some alternative has one; ``allOf``: each has one;
- each property in ``required`` has one (an optional property can be left out);
- an array with ``minItems`` > 0: each of its first ``minItems`` items has one;
- anything else (strings, numbers, ``enum``, ``const``): yes (llguidance checks their own constraints).
A reference this file cannot resolve (an anchor, another document) counts as having a value (llguidance decides).
"""

from __future__ import annotations

from urllib.parse import unquote


def unending_reference(schema) -> str | None:
    """The first ``$ref`` of ``schema`` (as written) whose target has no finite value, or None when every
    reference can end. Raises ValueError for a schema nested too deeply to walk."""
    refs: set[str] = set()
    try:
        _collect_refs(schema, refs)
        targets = {ref: _resolve(schema, ref) for ref in refs}
        ending = {ref for ref, target in targets.items() if target is _UNRESOLVED}
        changed = True
        while changed:
            changed = False
            for ref in sorted(refs - ending):
                if _has_value(targets[ref], ending, targets):
                    ending.add(ref)
                    changed = True
    except RecursionError:
        raise ValueError("the JSON schema is nested too deeply") from None
    stuck = sorted(refs - ending)
    return stuck[0] if stuck else None


_UNRESOLVED = object()


def _collect_refs(node, refs: set[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _collect_refs(item, refs)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                refs.add(value)
            elif key not in ("const", "enum", "default", "examples"):  # values, not schemas
                _collect_refs(value, refs)


def _resolve(root, ref: str):
    """The subschema a root-relative JSON pointer names (``#``, ``#/$defs/x``), else _UNRESOLVED."""
    if not ref.startswith("#"):
        return _UNRESOLVED
    fragment = unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        return _UNRESOLVED  # an anchor
    node = root
    for token in fragment.split("/")[1:] if fragment else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _UNRESOLVED  # a dangling reference: llguidance reports it
    return node


def _has_value(schema, ending: set[str], targets: dict) -> bool:
    if schema is False:
        return False
    if not isinstance(schema, dict):
        return True
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref in targets and ref not in ending:
        return False
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and not any(_has_value(s, ending, targets) for s in options):
            return False
    parts = schema.get("allOf")
    if isinstance(parts, list) and not all(_has_value(s, ending, targets) for s in parts):
        return False
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    for name in required:
        sub = properties.get(name, schema.get("additionalProperties", True)) if isinstance(name, str) else True
        if not _has_value(sub, ending, targets):
            return False
    least = schema.get("minItems")
    if isinstance(least, int) and least > 0:
        prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
        firsts = prefix[:least] + ([schema.get("items", True)] if least > len(prefix) else [])
        if not all(_has_value(s, ending, targets) for s in firsts):
            return False
    return True
