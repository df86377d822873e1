"""Netlink mechanisms: netns handles, links, addresses, routes/rules, ARP/NA announcements.

Mechanisms only: nothing here knows about CNI verbs, state files or policy.
"""
