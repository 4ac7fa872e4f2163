# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The attributes of a module that only reads the host."""

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Runs the same in check mode; it never changes anything.
    support: full
  diff_mode:
    description: Nothing changes, so there is nothing to diff.
    support: none
  idempotent:
    description: Reading twice gives the same result for the same host state.
    support: full
"""
