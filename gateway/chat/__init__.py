"""The chat shell: chats admitted and remembered by this replica, each turn's task and chunk log, and the plugin's waiting gated calls.
"""
