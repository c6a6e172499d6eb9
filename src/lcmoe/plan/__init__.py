"""lcmoe.plan"""
