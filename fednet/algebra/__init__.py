"""fednet.algebra"""
