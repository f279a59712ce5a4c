"""fednet.codes"""
