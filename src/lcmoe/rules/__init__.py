"""lcmoe.rules"""
