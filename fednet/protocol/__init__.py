"""fednet.protocol"""
