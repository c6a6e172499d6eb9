"""lcmoe.emit"""
