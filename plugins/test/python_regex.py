# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops.appliance.python_regex: whether a string compiles as a Python regular expression."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import re

DOCUMENTATION = r"""
name: python_regex
short_description: Whether a value is a string that compiles as a Python regular expression
version_added: "0.1.0"
description:
  - True for a string that C(re.compile) accepts; false for any other string and for a value
    that is not a string. Lets an input check refuse a bad pattern on the controller, with its
    own message, before a module on the host meets it.
options:
  _input:
    description: The value to test.
    type: raw
    required: true
author:
  - sparkops contributors (@sparkops)
"""

EXAMPLES = r"""
- name: Refuse a name pattern that is not a regular expression
  ansible.builtin.assert:
    that: ple_name_patterns | reject('sparkops.appliance.python_regex') | list | length == 0
"""

RETURN = r"""
_value:
  description: Whether the input is a string and compiles.
  type: bool
"""


def python_regex(value):
    if not isinstance(value, str):
        return False
    try:
        re.compile(value)
    except re.error:
        return False
    return True


class TestModule(object):
    def tests(self):
        return {"python_regex": python_regex}
