"""The gateway's configuration: the YAML schema and its values, each agent's and auth's sections, and what a reload may not loosen.
"""
