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

Checks beyond the type come from data: roles/<role>/meta/checks.yml beside the argument specs (not
in them: Ansible validates that file's keys). It maps option names to a list of checks:

    checks:
      serve_port:
        - {min: 1, max: 65535}
      serve_stop_timeout_s:
        - greater_than: serve_stop_grace_s
          reason: systemd must never kill docker stop
      serve_mtp_num_speculative_tokens:
        - {min: 1, when: {serve_mtp_enabled: true}}
      serve_extra_args:
        - refuse_flags:
            - {flag: [--max-model-len], owner: serve_max_model_len, reason: the memory plan sizes it}

One check may hold several of these keys; each failing key gives its own message
"<var> = <value>: <what is wrong, what is allowed>. Fix: <fix>.":

- min, max (inclusive), above, below (exclusive): a number, or each number of a list;
- power_of_two: true;
- one_of: allowed values, compared with their types (true is not 1); none_of: refused values;
- min_length: least length of a string, list or mapping;
- pattern: a name in PATTERNS (the one table of patterns); a string must match it whole, a list
  of strings each element; empty_ok: true lets "" pass;
- key_pattern, value_pattern: the keys / the values (as text) of a mapping; values: scalar (a
  string, number or boolean each) or string_or_number;
- regex: true: each element of a list is a Python regular expression (re.compile);
- fields: {field: {required: bool, pattern: NAME}} of a mapping, or of each mapping in a list,
  and with only_fields: true no other key;
- greater_than, at_least, less_than, at_most (numbers), equal_to, differs_from (paths compared
  without a trailing /, numbers by value): another option, by name;
- not_directly_in: another option, a directory: the value (a path) is not a file directly in it;
  with file_pattern: NAME only a file whose name matches PATTERNS[NAME] is refused there;
- refuse_flags (a list of command-line arguments): entries {flag: one or a list, owner, reason,
  when}; "--flag", "--flag=value" and vLLM's "--flag_name" spelling match;
- refuse_keys (a mapping): entries {key: one or a list, owner, reason, when};
- when: {option: value or [values]}: the check applies only when every option named has one of
  its values; unless: {option: value or [values]}: it does not apply when every one has (a list
  of such mappings: it does not apply when one of them holds);
- reason (why the bound, shown with it), fix (the fix; a default one is written otherwise).

The other options a check names are read from the host's variables, else from their literal
default in the argument specs; when one is not known yet (it cannot be templated), the check is
skipped, like a value that cannot be templated. A check runs only on a value of the right type.
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


def role_meta_files(name, roles_dir=None, roles=None):
    """(role, path, data) of roles/<role>/meta/<name> for every role that has it, in name order.

    `roles`: role names (without the collection prefix) to read; None or empty means all.
    """
    roles_dir = roles_dir or os.path.join(COLLECTION_ROOT, 'roles')
    for role in sorted(os.listdir(roles_dir)):
        if roles and role not in roles:
            continue
        path = os.path.join(roles_dir, role, 'meta', name)
        if not os.path.isfile(path):
            continue
        with open(path) as handle:
            yield role, path, yaml.load(handle, Loader=_SPEC_LOADER) or {}


def load_role_options(roles_dir=None, roles=None):
    """{option name: spec dict (with 'role')} over the roles' argument specs (every entry point).

    `roles`: role names (without the collection prefix) to read; None or empty means all.
    """
    options = {}
    for role, _path, data in role_meta_files('argument_specs.yml', roles_dir, roles):
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


def input_problems(values, options, checks=None, resolve=None):
    """Messages for every option in `values` ({name: value}) that `options` declares: its type,
    then (only when the type is right) its checks from `checks` ({name: [check]}, load_role_checks).
    `resolve(name)` gives another option's value (for relations and conditions), or UNKNOWN;
    by default the value in `values`, else the option's literal default."""
    checks = checks or {}
    if resolve is None:
        resolve = default_resolver(values, options)
    problems = []
    for name in sorted(values):
        if name in options:
            found = option_problems(name, values[name], options[name])
            problems.extend(found)
            if not found and name in checks:
                problems.extend(check_problems(name, values[name], checks[name], options[name], resolve))
    return problems


# --- checks beyond the type (roles/<role>/meta/checks.yml) -------------------------------------

UNIT_NAME = r'[a-zA-Z0-9][a-zA-Z0-9_.@-]*'
# The one table of named patterns: (regular expression the whole value must match, what it is).
PATTERNS = {
    'unit_name': (UNIT_NAME, 'a systemd unit name without .service (letters, digits, _ . @ -)'),
    'unit_file_name': (UNIT_NAME + r'\.service', 'a systemd unit name ending in .service'),
    'systemd_unit': (UNIT_NAME, 'a systemd unit name such as docker.service'),
    'container_name': (r'[a-zA-Z0-9][a-zA-Z0-9_.-]*', 'a Docker container name (letters, digits, _ . -)'),
    'image_ref': (r'[A-Za-z0-9][A-Za-z0-9._/:@-]*', 'an image reference such as nvcr.io/nvidia/vllm:25.09-py3'),
    'address': (r'[A-Za-z0-9_.:\[\]-]+', 'a host name or an IP address'),
    'docker_network': (r'[A-Za-z0-9][A-Za-z0-9_.:-]*', 'a Docker network (host, bridge, a name or container:NAME)'),
    'ipc_mode': (r'host|private|shareable|none|container:[A-Za-z0-9][A-Za-z0-9_.-]*',
                 'host, private, shareable, none or container:NAME'),
    'served_model_name': (r'[A-Za-z0-9][A-Za-z0-9._/:-]*', 'a model id (letters, digits, . _ / : -)'),
    'word': (r'[a-z0-9_]+', 'one lower-case word (letters, digits, _)'),
    'unix_user': (r'[a-z_][a-z0-9_-]{0,31}', 'a user name (lower-case letters, digits, _ -; at most 32)'),
    'inventory_group': (r'[A-Za-z_][A-Za-z0-9_]*', 'an inventory group name (letters, digits, _; not starting with a digit)'),
    'alloc_conf': (r'[A-Za-z0-9_:,.]*', 'a PYTORCH_CUDA_ALLOC_CONF value such as expandable_segments:True'),
    'calendar': (r'[A-Za-z0-9*:.,/~+ -]+', 'a systemd calendar expression such as "*-*-* 04:00:00" or "daily"'),
    'env_name': (r'[A-Za-z_][A-Za-z0-9_]*', 'an environment variable name (letters, digits, _)'),
    'shm_pattern': (r'[^/\s]+', 'a file-name pattern without / or whitespace'),
    'memory_max': (r'[0-9]+[KMGT]?', 'a systemd size such as 128M'),
    'docker_size': (r'[0-9]+[bkmg]?', 'a Docker size such as 2g'),
    'file_mode': (r'0?[0-7]{3}', 'an octal file mode in quotes such as "0755"'),
    'http_url': (r'https?://[^/\s]+(/\S*)?', 'an http(s):// URL'),
    'key_url': (r'(https?|file)://\S+', 'an http(s):// or file:// URL'),
    'hf_repo': (r'[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*', 'a Hugging Face repository owner/name'),
    'git_sha': (r'[0-9a-f]{40}', 'a 40-hex commit sha'),
    'debian_package': (r'[a-z0-9][a-z0-9+.-]+', 'a Debian package name such as libjemalloc2'),
    'debian_version': (r'([0-9]+:)?[0-9][A-Za-z0-9.+~-]*', 'a Debian package version such as "1.18.0-1"'),
    'driver_branch': (r'[0-9]{3}', 'three digits in quotes such as "580"'),
    'apt_source_name': (r'[a-z0-9][a-z0-9._-]*', 'a name of lower-case letters, digits, . _ -'),
    'apt_line': (r'deb .*', 'one apt line starting with "deb "'),
    'sysctl_name': (r'[a-z0-9_]+(\.[a-z0-9_]+)+', 'a sysctl name such as vm.dirty_background_bytes'),
    'sysctl_value': (r'(?!\s*$)[^#;=]*', "a number or words, not empty, without '#', ';' or '='"),
    'sysctl_file': (r'/etc/sysctl\.d/[A-Za-z0-9][A-Za-z0-9_.-]*\.conf',
                    'a *.conf file directly in /etc/sysctl.d (what systemd-sysctl reads)'),
    'repository': (r'[a-z0-9]+([._/-][a-z0-9]+)*', 'a lower-case image repository name'),
    'json_file': (r'/[^\n]*\.json', 'an absolute path to a .json file'),
    'prom_file': (r'/.*\.prom', 'an absolute path to a *.prom file'),
    'no_space': (r'\S+', 'one word without whitespace'),
    'not_empty': (r'.+', 'a non-empty string'),
    'safetensors_file': (r'.*\.safetensors', 'a *.safetensors file (read as a checkpoint shard)'),
    'interface': (r'[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}', 'a network interface name'),
    'ipv4': (r'((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])', 'an IPv4 address'),
    'ib_hca': (r'[A-Za-z0-9_:,^=-]+', 'an NCCL_IB_HCA value such as mlx5_0,mlx5_1'),
    'cluster_name': (r'[A-Za-z0-9][A-Za-z0-9_.-]*', 'a plain name (letters, digits, _ . -)'),
    'port_name': (r'[a-z_]+_port', 'a name ending in _port'),
    'prom_duration': (r'([0-9]+(ms|s|m|h|d|w|y))+', 'a Prometheus duration such as 15d or 12h30m'),
    'port': (r'[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]', 'a port number from 1 to 65535'),
}
UNKNOWN = object()
_CHECKS_FILE = 'checks.yml'
_NUMBER_KEYS = ('min', 'max', 'above', 'below', 'power_of_two')
_RELATIONS = {
    'greater_than': (lambda a, b: a > b, 'above'),
    'at_least': (lambda a, b: a >= b, 'at least'),
    'less_than': (lambda a, b: a < b, 'below'),
    'at_most': (lambda a, b: a <= b, 'at most'),
}
CHECK_KEYS = frozenset(('min', 'max', 'above', 'below', 'power_of_two', 'one_of', 'none_of', 'min_length', 'pattern', 'empty_ok',
                        'key_pattern', 'value_pattern', 'values', 'regex', 'fields', 'only_fields', 'greater_than',
                        'at_least', 'less_than', 'at_most', 'equal_to', 'differs_from', 'not_directly_in', 'file_pattern',
                        'refuse_flags', 'refuse_keys', 'when', 'unless', 'reason', 'fix'))


def load_role_checks(roles_dir=None, roles=None):
    """{option name: [check dict]} over roles/<role>/meta/checks.yml (`roles` as load_role_options).
    A check with a key this engine does not know, or a pattern not in PATTERNS, is an error."""
    checks = {}
    for _role, path, data in role_meta_files(_CHECKS_FILE, roles_dir, roles):
        for name, entries in (data.get('checks') or {}).items():
            for entry in entries or []:
                bad = sorted(set(entry) - CHECK_KEYS)
                names = [entry.get(key) for key in ('pattern', 'key_pattern', 'value_pattern', 'file_pattern') if entry.get(key)]
                names += [field.get('pattern') for field in (entry.get('fields') or {}).values() if field.get('pattern')]
                bad += ['pattern ' + pattern for pattern in names if pattern not in PATTERNS]
                if bad:
                    raise AnsibleError('%s: the check of %s has %s, which the engine does not know' % (path, name, ', '.join(bad)))
                checks.setdefault(name, []).append(entry)
    return checks


def default_resolver(values, options, variables=None, template=None):
    """resolve(name): the value in `values`, else (templated) in `variables`, else the option's
    literal default in `options`; UNKNOWN when none can be had."""
    variables = variables or {}

    def resolve(name):
        if name in values:
            return plain(values[name])
        if name in variables:
            if template is None:
                return plain(variables[name])
            try:
                return plain(template(variables[name]))
            except AnsibleError:
                return UNKNOWN
        default = (options.get(name) or {}).get('default', UNKNOWN)
        if isinstance(default, str) and '{{' in default:
            return UNKNOWN
        return default
    return resolve


def _same(left, right):
    """Equal, with booleans apart from numbers (true is not 1)."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    return left == right


def _condition(spec, resolve):
    """True/False for a when/unless mapping (every option has one of its values); None if unknown."""
    for name, wanted in spec.items():
        value = resolve(name)
        if value is UNKNOWN:
            return None
        wanted = wanted if isinstance(wanted, list) else [wanted]
        if not any(_same(value, item) for item in wanted):
            return False
    return True


def _applies(check, resolve):
    if check.get('when'):
        holds = _condition(check['when'], resolve)
        if not holds:
            return False
    unless = check.get('unless')
    for spec in (unless if isinstance(unless, list) else [unless] if unless else []):
        holds = _condition(spec, resolve)
        if holds is None or holds:
            return False
    return True


def _as_number(value):
    """A number for a value of a numeric type (or a numeric string), else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text) if _INT_TEXT.match(text) else float(text)
        except ValueError:
            return None
    return None


def _matches(pattern_name, value):
    return isinstance(value, str) and re.fullmatch(PATTERNS[pattern_name][0], value) is not None


def _flag_name(arg):
    """The flag of one command-line element, in vLLM's dash spelling ("--max_model_len=8" ->
    "--max-model-len"); None when it is not a flag."""
    text = str(arg).strip()
    if not text.startswith('-'):
        return None
    token = text.split(None, 1)[0].split('=', 1)[0]
    if token.startswith('--'):
        return '--' + token[2:].replace('_', '-')
    return token


def _listed(entry, key):
    found = entry.get(key)
    return found if isinstance(found, list) else [found]


def _refused_flags(value, entries, resolve):
    """(element, entry, flag) of every element of `value` that an applicable entry refuses."""
    hits = []
    for arg in value:
        flag = _flag_name(arg)
        if flag is None:
            continue
        for entry in entries:
            if _applies(entry, resolve) and flag in [_flag_name(item) for item in _listed(entry, 'flag')]:
                hits.append((arg, entry, flag))
                break
    return hits


def _owner_fix(entry, what):
    owner = entry.get('owner')
    if entry.get('fix'):
        return entry['fix']
    if owner:
        return 'remove %s; set %s instead' % (what, owner)
    return 'remove %s' % what


def _number_checks(check, number):
    """(problem, default fix) for the number checks of one check entry."""
    low, high = check.get('min'), check.get('max')
    bounds = ('from %s to %s' % (low, high) if low is not None and high is not None
              else 'at least %s' % low if low is not None else 'at most %s' % high if high is not None else '')
    out = []
    if low is not None and number < low:
        out.append(('below %s (allowed: %s)' % (low, bounds), 'give a value %s' % bounds))
    if high is not None and number > high:
        out.append(('above %s (allowed: %s)' % (high, bounds), 'give a value %s' % bounds))
    if check.get('above') is not None and not number > check['above']:
        out.append(('not above %s' % check['above'], 'give a value above %s' % check['above']))
    if check.get('below') is not None and not number < check['below']:
        out.append(('not below %s' % check['below'], 'give a value below %s' % check['below']))
    if check.get('power_of_two') and not (float(number).is_integer() and number > 0 and int(number) & (int(number) - 1) == 0):
        out.append(('not a power of two', 'give a power of two'))
    return out


def _text_checks(check, value):
    """(problem, default fix) for the pattern, length, mapping and list checks of one check entry."""
    out = []
    if check.get('min_length') is not None and isinstance(value, (str, list, tuple, Mapping)) and len(value) < check['min_length']:
        out.append(('empty' if check['min_length'] == 1 else 'shorter than %d' % check['min_length'],
                    'give at least %d %s' % (check['min_length'], 'character' if isinstance(value, str) else 'entry')))
    pattern = check.get('pattern')
    if pattern:
        what = PATTERNS[pattern][1]
        items = value if isinstance(value, (list, tuple)) else [value]
        for index, item in enumerate(items):
            if check.get('empty_ok') and item == '':
                continue
            if not _matches(pattern, item):
                where = 'element [%d] (%s) is ' % (index, show(item)) if isinstance(value, (list, tuple)) else ''
                out.append(('%snot %s%s' % (where, what, ' (or "" for none)' if check.get('empty_ok') else ''),
                            'give %s' % what))
                break
    if isinstance(value, Mapping):
        if check.get('key_pattern'):
            bad = [key for key in value if not _matches(check['key_pattern'], key)]
            if bad:
                out.append(('the key %s is not %s' % (show(bad[0]), PATTERNS[check['key_pattern']][1]), 'rename the key'))
        kind = check.get('values')
        for key, item in value.items():
            if kind and (isinstance(item, (Mapping, list, tuple)) or item is None
                         or (kind == 'string_or_number' and isinstance(item, bool))):
                out.append(('the value of %s is %s, not one plain value (%s)'
                            % (show(key), show(item), 'a string or a number' if kind == 'string_or_number' else 'a string, number or boolean'),
                            'give %s one value (quote it)' % show(key)))
                break
            if check.get('value_pattern') and not _matches(check['value_pattern'], str(item)):
                out.append(('the value of %s (%s) is not %s' % (show(key), show(item), PATTERNS[check['value_pattern']][1]),
                            'fix the value of %s' % show(key)))
                break
    if check.get('regex') and isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            try:
                re.compile(item)
            except (re.error, TypeError) as exc:
                out.append(('element [%d] (%s) is not a Python regular expression (%s)' % (index, show(item), exc),
                            'write each element as a valid regular expression'))
                break
    if check.get('fields'):
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            problem = _field_problem(item, check['fields'], check.get('only_fields'))
            if problem:
                out.append(('the entry %s %s' % (show(item), problem), 'give each entry %s' % _fields_words(check)))
                break
    if check.get('one_of') is not None and not any(_same(value, item) for item in check['one_of']):
        out.append(('not one of %s' % ', '.join(show(item) for item in check['one_of']), 'choose one of them'))
    if check.get('none_of') is not None and any(_same(value, item) for item in check['none_of']):
        out.append(('one of the values refused here (%s)' % ', '.join(show(item) for item in check['none_of']), 'choose another value'))
    return out


def _field_problem(item, fields, only):
    if not isinstance(item, Mapping):
        return 'is not a mapping'
    for field, rule in fields.items():
        if field not in item:
            if rule.get('required'):
                return 'lacks %s' % field
            continue
        if rule.get('pattern') and not _matches(rule['pattern'], item[field]):
            return 'has %s %s, not %s' % (field, show(item[field]), PATTERNS[rule['pattern']][1])
    extra = sorted(set(item) - set(fields))
    if only and extra:
        return 'has %s (only %s, and nothing else)' % (', '.join(extra), ', '.join(fields))
    return None


def _fields_words(check):
    words = []
    for field, rule in check['fields'].items():
        words.append('%s%s' % (field, '' if rule.get('required') else ' (optional)'))
    return ', '.join(words) + (' and nothing else' if check.get('only_fields') else '')


def _relation_checks(check, name, value, resolve):
    out = []
    for key, (compare, words) in _RELATIONS.items():
        other = check.get(key)
        if not other:
            continue
        there = resolve(other)
        mine, theirs = _as_number(value), _as_number(there) if there is not UNKNOWN else None
        if mine is None or theirs is None:
            continue
        if not compare(mine, theirs):
            out.append(('not %s %s (%s)' % (words, other, show(there)),
                        'give %s a value %s %s, or change %s' % (name, words, show(there), other)))
    if check.get('equal_to'):
        there = resolve(check['equal_to'])
        if there is not UNKNOWN and not _same(value, there):
            out.append(('not equal to %s (%s)' % (check['equal_to'], show(there)),
                        'give both the same value'))
    if check.get('differs_from'):
        there = resolve(check['differs_from'])
        if isinstance(there, str) and isinstance(value, str) and (value.rstrip('/') or '/') == (there.rstrip('/') or '/'):
            out.append(('the same as %s (%s)' % (check['differs_from'], show(there)), 'give it a path of its own'))
        elif _as_number(value) is not None and there is not UNKNOWN and _as_number(there) == _as_number(value):
            out.append(('the same as %s (%s)' % (check['differs_from'], show(there)), 'give it a value of its own'))
    if check.get('not_directly_in'):
        there = resolve(check['not_directly_in'])
        pattern = check.get('file_pattern')
        mine = re.sub('/+', '/', value).rstrip('/') if isinstance(value, str) else ''
        if (isinstance(there, str) and there and mine and posixpath.dirname(mine) == (re.sub('/+', '/', there).rstrip('/') or '/')
                and (not pattern or _matches(pattern, posixpath.basename(mine)))):
            out.append(('%s directly in %s (%s)' % (PATTERNS[pattern][1] if pattern else 'a file', check['not_directly_in'], show(there)),
                        'give it a path outside %s' % check['not_directly_in']))
    return out


def check_problems(name, value, checks, spec=None, resolve=None):
    """Messages for `value` of option `name` against its checks (roles/<role>/meta/checks.yml)."""
    spec = spec or {}
    value = plain(value)
    if resolve is None:
        resolve = default_resolver({name: value}, {})
    shown = _HIDDEN if spec.get('no_log', False) else show(value)
    problems = []

    def say(problem, fix, check):
        reason = check.get('reason')
        fix = check.get('fix') or fix
        problems.append('%s = %s: %s%s. Fix: %s.' % (name, shown, problem, '; %s' % reason if reason else '', fix))

    for check in checks:
        if not _applies(check, resolve):
            continue
        if any(check.get(key) is not None for key in _NUMBER_KEYS):
            items = ([('', value)] if not isinstance(value, (list, tuple))
                     else [('element [%d] (%s) is ' % (index, show(item)), item) for index, item in enumerate(value)])
            for where, item in items:
                number = _as_number(item)
                for problem, fix in _number_checks(check, number) if number is not None else []:
                    say(where + problem, fix, check)
        for problem, fix in _text_checks(check, value):
            say(problem, fix, check)
        for problem, fix in _relation_checks(check, name, value, resolve):
            say(problem, fix, check)
        if check.get('refuse_flags') and isinstance(value, (list, tuple)):
            for arg, entry, flag in _refused_flags(value, check['refuse_flags'], resolve):
                what = flag if _flag_name(arg) == str(arg).strip() or spec.get('no_log') else '%s (as %s)' % (flag, show(arg))
                problems.append('%s = %s: %s is refused here: %s. Fix: %s.'
                                % (name, shown, what, entry.get('reason') or 'set by the roles', _owner_fix(entry, flag)))
        if check.get('refuse_keys') and isinstance(value, Mapping):
            for key in value:
                for entry in check['refuse_keys']:
                    if _applies(entry, resolve) and key in _listed(entry, 'key'):
                        problems.append('%s = %s: the key %s is refused here: %s. Fix: %s.'
                                        % (name, shown, key, entry.get('reason') or 'set by the roles', _owner_fix(entry, key)))
                        break
    return problems


class RoleInputsLookup(LookupBase):
    """What the role_options and input_problems lookups share: their terms name the roles whose
    options are read (none: every role), and defined values are templated before they are checked."""

    def role_options(self, terms, variables, **kwargs):
        """set_options, then {option name: spec} of the roles named in terms."""
        self.set_options(var_options=variables, direct=kwargs)
        return load_role_options(roles=list(terms or []))

    def role_checks(self, terms):
        """{option name: [check]} of the roles named in terms (their meta/checks.yml)."""
        return load_role_checks(roles=list(terms or []))

    def resolver(self, values, options, variables):
        """resolve(name) for the checks: another option's value (see default_resolver)."""
        return default_resolver(values, options, variables, self._templar.template)

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
