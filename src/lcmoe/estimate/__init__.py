"""lcmoe.estimate"""
