"""kubeforge.operator"""
