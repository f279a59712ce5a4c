"""fednet.sim"""
