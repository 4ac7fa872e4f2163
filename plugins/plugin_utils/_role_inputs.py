# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's role options, read from roles/*/meta/argument_specs.yml, and the checks every
option gets from its declared type. Private helper of the role_options and input_problems lookups.

Ansible's own role argument validation converts where it can: the string "false" passes as a bool
(and is true in a condition), a string passes as a list (split on commas), a number passes as a
string. These checks refuse instead, and name the variable, the value and the fix:

- bool: a YAML boolean (true/false), nothing else;
- int: a whole number (or a string of digits); float: a number (or a numeric string); never a boolean;
- str: a string (quote a number); list: a list, never a string; dict: a mapping;
- path: an absolute, normalised path without whitespace; "" only where the option's default is ""
  or its description says "empty for none";
- choices: one of them;
- in every option of every type: no control character (newline, tab, ...) in any string, dict keys
  included, since the values end up in files that are read line by line (sysctl.d, env files,
  unit files, Dockerfile, memwatch's config).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import math
import os
import posixpath
import re

try:
    from collections.abc import Mapping
except ImportError:  # pragma: no cover - Python 2 is not supported by the collection
    Mapping = dict

import yaml
from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CONTROL = re.compile(r'[\x00-\x1f\x7f]')
_CONTROL_NAMES = {'\n': 'a newline', '\r': 'a carriage return', '\t': 'a tab'}
_INT_TEXT = re.compile(r'^[+-]?[0-9]+$')
_HIDDEN = '<hidden: no_log>'
# libyaml's safe loader where PyYAML has it (about ten times faster: every role's validate task
# reads the specs again), the pure-Python one otherwise; both build the same plain data.
_SPEC_LOADER = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)


def load_role_options(roles_dir=None, roles=None):
    """{option name: spec dict (with 'role')} over the roles' argument specs (every entry point).

    `roles`: role names (without the collection prefix) to read; None or empty means all.
    """
    roles_dir = roles_dir or os.path.join(COLLECTION_ROOT, 'roles')
    options = {}
    for role in sorted(os.listdir(roles_dir)):
        if roles and role not in roles:
            continue
        spec_file = os.path.join(roles_dir, role, 'meta', 'argument_specs.yml')
        if not os.path.isfile(spec_file):
            continue
        with open(spec_file) as handle:
            data = yaml.load(handle, Loader=_SPEC_LOADER) or {}
        for entry in (data.get('argument_specs') or {}).values():
            for name, spec in ((entry or {}).get('options') or {}).items():
                if name not in options:
                    merged = dict(spec or {})
                    merged['role'] = role
                    options[name] = merged
    return options


def names_by_type(options, wanted):
    """Sorted option names whose declared type is `wanted` (str is the default type)."""
    return sorted(name for name, spec in options.items() if spec.get('type', 'str') == wanted)


def plain(value):
    """A copy of `value` as plain Python types (templated/lazy containers and tagged scalars)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return dict((plain(key), plain(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, str):
        return ''.join([value])
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def show(value):
    """The value as the user would write it in JSON (a newline shows as \\n)."""
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def _control_chars(value, where=''):
    """(description, where) of the first control character in any string of `value`, or None."""
    if isinstance(value, str):
        found = _CONTROL.search(value)
        if found:
            char = found.group(0)
            return _CONTROL_NAMES.get(char, 'the control character %r' % char), where
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            hit = _control_chars(key, '%s key %s' % (where, show(key))) or _control_chars(item, '%s[%s]' % (where, show(key)))
            if hit:
                return hit
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            hit = _control_chars(item, '%s[%d]' % (where, index))
            if hit:
                return hit
    return None


def _empty_allowed(spec):
    description = spec.get('description', '')
    if isinstance(description, list):
        description = ' '.join(description)
    return spec.get('default') == '' or 'empty for none' in description or '"" = none' in description


def path_problem(value, empty_ok=False):
    """Why `value` is not an absolute, normalised path without whitespace (None when it is)."""
    if not isinstance(value, str):
        return 'a %s, not a path' % _kind(value), 'give an absolute path as a string'
    if value == '':
        if empty_ok:
            return None
        return 'empty', 'give an absolute path'
    if not value.startswith('/'):
        return 'not an absolute path', 'give a path that starts with /'
    if re.search(r'\s', value):
        return 'a path with whitespace (unit files and command lines would split it there)', 'choose a path without whitespace'
    if value.startswith('//') or posixpath.normpath(value) != value:
        return ('not a normalised path (no "..", ".", "//" or trailing /)',
                'write the path it means, e.g. %s' % show(posixpath.normpath(value).replace('//', '/')))
    return None


def _kind(value):
    """The YAML word for the type of `value`."""
    for kind, name in ((bool, 'boolean'), (int, 'whole number'), (float, 'number'), (str, 'string'),
                       (Mapping, 'mapping'), ((list, tuple), 'list')):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _number_problem(value, whole):
    kind = 'a whole number' if whole else 'a number'
    if isinstance(value, bool):
        return 'a boolean, not %s' % kind, 'give %s' % kind
    if isinstance(value, int):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return 'not a finite number', 'give %s' % kind
        if whole and not value.is_integer():
            return 'not a whole number', 'give a whole number'
        return None
    if isinstance(value, str):
        text = value.strip()
        if whole and _INT_TEXT.match(text):
            return None
        if not whole:
            try:
                if math.isfinite(float(text)) and text.lower() not in ('nan', 'inf', '-inf', 'infinity'):
                    return None
            except ValueError:
                pass
        return 'a string, not %s' % kind, 'give %s without quotes' % kind
    return 'a %s, not %s' % (_kind(value), kind), 'give %s' % kind


def _type_problem(value, spec):
    """(problem, fix) for a value that does not have the declared type, else None."""
    wanted = spec.get('type', 'str')
    if wanted == 'bool':
        if isinstance(value, bool):
            return None
        if isinstance(value, str):
            return ('a string, not a YAML boolean (a non-empty string counts as true in a condition)',
                    'write true or false without quotes')
        return 'a %s, not a YAML boolean' % _kind(value), 'write true or false without quotes'
    if wanted in ('int', 'float'):
        return _number_problem(value, wanted == 'int')
    if wanted == 'str':
        if isinstance(value, str):
            return None
        return 'a %s, not a string' % _kind(value), 'quote it (write it as a string)'
    if wanted == 'path':
        return path_problem(value, _empty_allowed(spec))
    if wanted == 'list':
        if not isinstance(value, (list, tuple)):
            return ('a %s, not a list (a string would be taken character by character)' % _kind(value),
                    'write it as a YAML list, e.g. [%s]' % show(value))
        elements = spec.get('elements')
        if elements:
            for index, item in enumerate(value):
                if elements == 'path':
                    problem = path_problem(item)
                else:
                    problem = _type_problem(item, {'type': elements})
                if problem:
                    return 'element [%d] (%s) is %s' % (index, show(item), problem[0]), problem[1]
        return None
    if wanted == 'dict':
        if not isinstance(value, Mapping):
            return 'a %s, not a mapping' % _kind(value), 'write it as a YAML mapping (key: value)'
        for key in value:
            if not isinstance(key, str):
                return 'a mapping with the key %s, not a string' % show(key), 'quote the key'
        return None
    return None


def option_problems(name, value, spec):
    """Messages (naming the variable, the value and the fix) for one option's value; [] if fine."""
    value = plain(value)
    secret = spec.get('no_log', False)
    shown = _HIDDEN if secret else show(value)
    if value is None:
        if spec.get('default') is None and not spec.get('required', False):
            return []
        return ['%s = null: not a value. Fix: give it a value (or remove it to get the default %s).' % (name, show(spec.get('default')))]
    problems = []
    hit = _control_chars(value)
    if hit:
        what, where = hit
        problems.append('%s = %s: %s holds %s. Values are written into files read line by line (sysctl.d, env and unit '
                        'files, memwatch\'s config), where a control character could add a line. Fix: remove it.'
                        % (name, shown, (name + where) if where else 'the value', what))
        return problems
    found = _type_problem(value, spec)
    if found:
        problem, fix = found
        if secret:
            fix = fix.replace(show(value), _HIDDEN)
        problems.append('%s = %s: %s. Fix: %s.' % (name, shown, problem, fix))
        return problems
    choices = spec.get('choices')
    if choices and value not in choices:
        problems.append('%s = %s: not one of %s. Fix: choose one of them.' % (name, shown, ', '.join(show(c) for c in choices)))
    return problems


def input_problems(values, options):
    """Messages for every option in `values` ({name: value}) that `options` declares."""
    problems = []
    for name in sorted(values):
        if name in options:
            problems.extend(option_problems(name, values[name], options[name]))
    return problems


class RoleInputsLookup(LookupBase):
    """What the role_options and input_problems lookups share: their terms name the roles whose
    options are read (none: every role), and defined values are templated before they are checked."""

    def role_options(self, terms, variables, **kwargs):
        """set_options, then {option name: spec} of the roles named in terms."""
        self.set_options(var_options=variables, direct=kwargs)
        return load_role_options(roles=list(terms or []))

    def defined_values(self, options, variables):
        """{name: templated value} of the options defined in variables; a value that refers to
        something not known yet is left out (the role's own checks see it later)."""
        variables = variables or {}
        values = {}
        for name in options:
            if name not in variables:
                continue
            try:
                values[name] = self._templar.template(variables[name])
            except AnsibleError:
                continue
        return values
